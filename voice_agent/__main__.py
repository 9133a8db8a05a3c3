from voice_agent.cli import main

raise SystemExit(main())
