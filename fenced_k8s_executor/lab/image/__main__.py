from fenced_k8s_executor.lab.image import main

raise SystemExit(main())
