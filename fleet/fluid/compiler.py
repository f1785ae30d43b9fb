"""``import fleet.fluid.compiler`` (Paddle's ``import paddle.fluid.compiler``) gives ``fleet.framework.compiler`` itself."""
import sys

import fleet.framework.compiler

sys.modules[__name__] = fleet.framework.compiler
