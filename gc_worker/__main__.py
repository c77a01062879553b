import sys

from countersink.cli import main

sys.exit(main(["gc", *sys.argv[1:]]))
