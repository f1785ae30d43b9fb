"""``import fleet.fluid.param_attr`` (Paddle's ``import paddle.fluid.param_attr``) gives ``fleet.param_attr`` itself."""
import sys

import fleet.param_attr

sys.modules[__name__] = fleet.param_attr
