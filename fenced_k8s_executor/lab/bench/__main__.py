import sys

from fenced_k8s_executor.lab.bench import main

sys.exit(main())
