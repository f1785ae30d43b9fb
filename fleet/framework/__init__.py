"""The static program: programs, variables, ops, backward, scopes and the executor."""
from fleet.framework.tensor import LoDTensor, SparseRows
from fleet.framework.program import (Block, Operator, Parameter, Program, Variable,
                                     default_main_program, default_startup_program,
                                     program_guard, reset_default_programs, unique_name)
from fleet.framework.scope import Scope, global_scope, scope_guard
from fleet.framework.backward import append_backward, gradients
from fleet.framework.executor import Executor
from fleet.framework.trainer import FetchHandler
from fleet.framework.registry import OpDef, register_op
