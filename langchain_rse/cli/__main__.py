"""``python -m langchain_rse.cli``: the ``langchain-rse`` command."""

from langchain_rse.cli import main

raise SystemExit(main())
