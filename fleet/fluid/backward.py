"""``import fleet.fluid.backward`` (Paddle's ``import paddle.fluid.backward``) gives ``fleet.framework.backward`` itself."""
import sys

import fleet.framework.backward

sys.modules[__name__] = fleet.framework.backward
