"""``import fleet.fluid.optimizer`` (Paddle's ``import paddle.fluid.optimizer``) gives ``fleet.optimizer`` itself."""
import sys

import fleet.optimizer

sys.modules[__name__] = fleet.optimizer
