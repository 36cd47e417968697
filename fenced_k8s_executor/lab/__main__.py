from fenced_k8s_executor.lab.cli import main

raise SystemExit(main())
