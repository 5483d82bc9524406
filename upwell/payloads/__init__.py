"""Payload definitions: the data that says how a lab's tool runs (see docs/byo-code.md).

``definition`` is the model, ``validate`` checks a file and names each problem,
``params`` checks a manifest's params against a definition, ``registry`` finds
definitions (built-in files and the ``payloads`` container), ``schema`` writes the
published JSON Schema.
"""
