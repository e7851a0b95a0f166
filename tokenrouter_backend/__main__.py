"""`python -m tokenrouter_backend` = the `tokenrouter` command."""
import sys

from tokenrouter_backend.cli.main import main

sys.exit(main())
