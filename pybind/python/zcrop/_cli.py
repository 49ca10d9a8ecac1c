"""The ``zcrop`` console script: runs the same CLI as the Rust ``zcrop`` binary."""

import sys

from zcrop._zcrop import cli_main


def main() -> int:
    """Run the zcrop command line with ``sys.argv`` and return its exit code."""
    code = cli_main(sys.argv)
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
