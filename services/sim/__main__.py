from services.sim.cli import main

raise SystemExit(main())
