"""``import fleet.fluid.initializer`` (Paddle's ``import paddle.fluid.initializer``) gives ``fleet.initializer`` itself."""
import sys

import fleet.initializer

sys.modules[__name__] = fleet.initializer
