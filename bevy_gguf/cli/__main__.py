import sys

from bevy_gguf.cli import main

sys.exit(main())
