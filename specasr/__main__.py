import sys

from specasr.cli import main

sys.exit(main())
