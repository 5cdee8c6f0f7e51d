import sys

from tracengine.cli.main import main

sys.exit(main())
