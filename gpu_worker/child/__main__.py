"""`python -m gpu_worker.child FD_IN FD_OUT TMPDIR ROLE`: the sandbox child process (child.process)."""

import sys

from gpu_worker.child.process import main

sys.exit(main(sys.argv[1:]))
