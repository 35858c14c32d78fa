"""Programmatic dependent launch (PDL) from inside Triton kernels, Hopper and newer.

A kernel launched with PDL may start while the kernel before it still runs; it must wait for that
kernel (griddepcontrol.wait) before reading what it writes or writing what it reads. A kernel lets
the one after it start launching with griddepcontrol.launch_dependents.

Both are written as pure inline assembly that returns 0, which the caller adds to an address: impure
assembly makes PyTorch's analysis of which arguments a Triton kernel writes give up and assume all of
them are, and Inductor then copies every input of the kernel (seen on torch 2.11: four copy kernels
per attention call). The added 0 orders the instruction before the loads that use the address.
Importing this module needs Triton.
"""

import triton
import triton.language as tl


@triton.jit
def wait_for_inputs():
    """Wait until the kernel before has finished and its writes are visible, then let the kernel
    after start launching. Add the result to every address that kernel may have written."""
    return tl.inline_asm_elementwise("griddepcontrol.wait; griddepcontrol.launch_dependents; mov.u32 $0, 0;",
                                     "=r", [], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def let_dependents_launch():
    """Let the kernel after start launching (it waits for this one's writes before reading them)."""
    return tl.inline_asm_elementwise("griddepcontrol.launch_dependents; mov.u32 $0, 0;",
                                     "=r", [], dtype=tl.int32, is_pure=True, pack=1)


def launch_options(pdl: bool) -> dict:
    """A kernel launch's keyword for PDL: given only when PDL is on, since a backend without it
    (AMD's, in Triton 3.6) rejects the keyword even when it is False."""
    return {"launch_pdl": True} if pdl else {}
