"""The compressed allreduce algorithms of csrc/algorithms, in tensor operations (any device).

Each module mirrors one native algorithm step for step: the same pieces, segments and chunks
(chunk boundaries on the compressor's alignment), the same random stream per payload
(:func:`common.streams_for`, payload.cc's ``streams_for``), the decode-adds in the same order,
the same averaging point and the same error-feedback residual, so that on the same input they
give the native engine's bytes (docs/gpu-engine.md says where and why not). They talk only to a
:class:`torch_cgx.device.transport.GroupTransport` and to a device codec, and read no tensor
value on the host but the sizes of data-dependent payloads.

- :mod:`.common`: streams, chunk ranges, one call's state (:class:`common.Run`);
- :mod:`.sra`, :mod:`.ring`, :mod:`.tree`: the dense algorithms;
- :mod:`.gather`: allgather-reduce (sparse or data-sized payloads) and sum-reduce (random-k);
- :mod:`.reduce_scatter`: the one-shot compressed reduce-scatter;
- :mod:`.hierarchical`: exact inside a node, compressed across nodes;
- :mod:`.rotation`: the seeded Walsh-Hadamard rotation around any of them.
"""
