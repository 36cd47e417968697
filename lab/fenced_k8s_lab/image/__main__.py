from fenced_k8s_lab.image import main

raise SystemExit(main())
