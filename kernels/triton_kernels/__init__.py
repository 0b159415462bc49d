"""Triton implementations of the kernels, for CUDA; on CPU they run under ``TRITON_INTERPRET=1``.

Written within the interpreter's limits so the same code is tested on CPU: ``tl.math`` functions only (no
libdevice; tanh as ``2*sigmoid(2x)-1``), one config per kernel (no multi-config autotune), bf16 loads
upcast to fp32, an explicit round-to-nearest-even fp32 -> bf16 helper, 64-bit offsets. Importing this
package imports triton; callers import it lazily, so zerobench runs without triton installed.
"""
