"""Support that the tests (``tests/``) and the benchmarks (``bench/``) share.

Real peers and harnesses both sides drive the service with: free local
ports, ``voice-agent serve`` in a process of its own, a scripted
OpenAI-wire LLM, a Piper speech server, recorded speech, tiny NeMo and
Coqui models, headless Chromium and a SIP lab; plus the benchmarks'
percentile and table. Tests and benchmarks each import from here, never
from one another.

The service never imports this package. Some of it needs a source
checkout: the recordings and SIP scenarios stay in ``tests/`` and the SIP
gateway in ``deploy/`` (``checkout.py`` finds them, and says so when they
are not there), and some needs the dev or model extras (Playwright, NeMo,
Coqui), imported by the modules that use them.
"""
