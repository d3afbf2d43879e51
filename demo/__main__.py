"""`python -m demo` from the checkout's root (what `make demo` runs)."""

from demo.demo import main

raise SystemExit(main())
