"""Fusion: collect the pending values a sync needs into one program.

Only what live tensors reach is collected (dead work is dropped), and the
program key is canonical: it names buffers by position, never by identity.
"""

from lazytpu.fusion.program import FailedInput, Program, ProgramOp, build_program, op_node, split_roots

__all__ = ["FailedInput", "Program", "ProgramOp", "build_program", "op_node", "split_roots"]
