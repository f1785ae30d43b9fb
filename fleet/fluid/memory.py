"""``fluid.memory_optimize`` and ``fluid.release_memory``: accepted and checked, and they
change nothing, as in Paddle since 1.6 (where both only log that they are deprecated).

fleet needs no memory pass: each thread keeps a step's temporaries in one dict of its
own, overwritten by the next step, so a step holds each temporary once.
"""
import logging

from fleet.framework.program import Program

log = logging.getLogger("fleet")
_told = set()


def _check(program, what):
    if type(program).__name__ == "CompiledProgram":
        program = program.program
    if not isinstance(program, Program):
        raise TypeError(f"{what}: input_program must be a fluid.Program, got {type(program).__name__}")
    if what not in _told:
        _told.add(what)
        log.info("fleet: fluid.%s changes nothing (as in Paddle since 1.6): a step's temporaries are "
                 "kept once per thread and overwritten by the next step", what)


def memory_optimize(input_program, skip_opt_set=None, print_log=False, level=0, skip_grads=True):
    """Checks ``input_program`` and leaves it unchanged (see the module docstring).

    Raises:
        TypeError: not a Program.
    """
    _check(input_program, "memory_optimize")


def release_memory(input_program, skip_opt_set=None):
    """Checks ``input_program`` and leaves it unchanged (see the module docstring).

    Raises:
        TypeError: not a Program.
    """
    _check(input_program, "release_memory")
