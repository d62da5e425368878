"""`python -m chatpage.cli ...` runs the `chatpage` command."""

import sys

from chatpage.cli.main import main

sys.exit(main())
