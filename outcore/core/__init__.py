"""The runtime core: what runs one rank's pieces of a plan, knowing no parallelism.

Messaging between ranks (:mod:`~outcore.core.comm`, same-host sockets in
:mod:`~outcore.core.samehost`), the values that cross them (:mod:`~outcore.core.values`), the
piece modules cut from the traced model (:mod:`~outcore.core.modules`), the backward across
piece boundaries (:mod:`~outcore.core.boundary`), and the executor that runs a rank's action
list (:mod:`~outcore.core.executor`) with its memory policies (:mod:`~outcore.core.offload`),
random streams (:mod:`~outcore.core.randomness`) and memory tracker
(:mod:`~outcore.hardware.memtrack`). The parallelisms (:mod:`outcore.parallel`) plug in above it;
the trainer (:mod:`outcore.runtime.trainer`) assembles a rank from both.
"""
