from agentq.cli import main

raise SystemExit(main())
