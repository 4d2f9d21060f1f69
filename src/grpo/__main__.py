"""`python -m grpo ...` is the `grpo` command; torchrun starts it this way: `torchrun ... -m grpo train`."""

import sys

from grpo.commands.cli import main

sys.exit(main())
