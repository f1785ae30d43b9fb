"""The static program: programs, variables, ops, backward, scopes and the executor."""
from fleet.framework.tensor import LoDTensor, SparseRows
