import sys

from countersink.cli import main

sys.exit(main(["consume", *sys.argv[1:]]))
