"""Optimizer ops: one per parameter, applying a ``fleet.optimizer.rules`` rule in place."""
from fleet.framework.registry import OpDef, register_op
from fleet.framework.tensor import SparseRows
from fleet.optimizer.rules import make_rule

_RULE_ATTRS = {
    "sgd": (),
    "momentum": ("momentum", "use_nesterov"),
    "adagrad": ("epsilon", "initial_accumulator_value"),
    "adam": ("beta1", "beta2", "epsilon", "lazy_mode"),
}


class _OptimizerOp(OpDef):
    """Inputs: Param, Grad and one slot per rule state; attr learning_rate (already
    multiplied by the parameter's own rate)."""

    def __init__(self):
        self._rules = {}

    def rule(self, attrs):
        key = tuple(attrs.get(k) for k in _RULE_ATTRS[self.type])
        rule = self._rules.get(key)
        if rule is None:
            rule = self._rules[key] = make_rule(self.type, {k: attrs[k] for k in _RULE_ATTRS[self.type] if k in attrs})
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
