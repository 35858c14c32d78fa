"""engine.model.decode_attention made runnable in Triton's interpreter (TRITON_INTERPRET=1): its
kernel's loop bounds are tensors, and the interpreter's range() needs Python ints. For the
interpret_*.py checks of this folder, run from the repository root."""
import builtins
import sys

import numpy as np

sys.path.insert(0, ".")
from engine.model import decode_attention  # noqa: E402


def _int(x):
    data = getattr(getattr(x, "handle", x), "data", x)
    return int(np.asarray(data).reshape(-1)[0])


decode_attention.range = lambda *args: builtins.range(*[_int(a) for a in args])
