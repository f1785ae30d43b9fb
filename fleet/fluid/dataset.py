"""``import fleet.fluid.dataset`` (Paddle's ``import paddle.fluid.dataset``) gives ``fleet.dataset`` itself."""
import sys

import fleet.dataset

sys.modules[__name__] = fleet.dataset
