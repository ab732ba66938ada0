"""`python -m hpcai500_tf.cli`: the hpcai500-tf command (how the launcher starts its workers)."""

import sys

from hpcai500_tf.cli import main

if __name__ == "__main__":  # not again in a process multiprocessing spawns from this one
    sys.exit(main())
