from transformer_nmt.cli import main

raise SystemExit(main())
