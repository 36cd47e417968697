from fenced_k8s_lab.cli import main

raise SystemExit(main())
