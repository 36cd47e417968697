import sys

from fenced_k8s_lab.bench import main

sys.exit(main())
