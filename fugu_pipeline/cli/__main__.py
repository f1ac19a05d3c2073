import sys

from fugu_pipeline.cli.main import main

sys.exit(main())
