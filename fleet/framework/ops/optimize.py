"""Optimizer ops: one per parameter, applying a ``fleet.rules`` rule in place."""
from fleet.framework.registry import OpDef, register_op
from fleet.framework.tensor import SparseRows
from fleet.rules import rule_from_op_attrs

class _OptimizerOp(OpDef):
    """Inputs: Param, Grad and one slot per rule state; attr learning_rate (already
    multiplied by the parameter's own rate)."""

    def __init__(self):
        self._rules = {}

    def rule(self, attrs):
        key = tuple(sorted((k, v) for k, v in attrs.items() if k not in ("learning_rate", "op_role", "is_test")))
        rule = self._rules.get(key)
        if rule is None:
            rule = self._rules[key] = rule_from_op_attrs(self.type, attrs)
        return rule

    def forward(self, ctx):
        rule = self.rule(ctx.attrs)
        param = ctx.input("Param")
        grad = ctx.input("Grad")
        state = {name: ctx.input(name) for name in rule.state_names}
        lr = ctx.attrs["learning_rate"]
        if isinstance(grad, SparseRows):
            rule.apply_sparse(param, grad.rows, grad.values, state, lr)
        else:
            rule.apply_dense(param, grad, state, lr)


@register_op
class SGDOp(_OptimizerOp):
    type = "sgd"


@register_op
class MomentumOp(_OptimizerOp):
    type = "momentum"


@register_op
class AdagradOp(_OptimizerOp):
    type = "adagrad"


@register_op
class AdamOp(_OptimizerOp):
    type = "adam"
