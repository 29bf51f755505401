import sys

from lite_llm.cli import main

sys.exit(main())
