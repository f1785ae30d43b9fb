"""``import fleet.fluid.layers`` (Paddle's ``import paddle.fluid.layers``) gives ``fleet.layers`` itself."""
import sys

import fleet.layers

sys.modules[__name__] = fleet.layers
