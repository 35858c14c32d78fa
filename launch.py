#!/usr/bin/env python
"""Start S1-mini Studio from a checkout (Hugging Face Spaces, Windows): the same as the installed
`s1-mini-studio` command. The code lives in app/launcher.py; `python launch.py --help` lists the flags."""

import sys

from app.launcher import main

if __name__ == "__main__":
    sys.exit(main())
