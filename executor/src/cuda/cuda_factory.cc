// Intentionally empty. The CUDA half of MakeBackend (GPU choice by local rank,
// device + kernels + NCCL world) lives in src/backends.cc, which builds it only
// from the public factories of backends.h (MakeCudaDevice, MakeCudaKernels,
// MakeNcclWorld) so that the same code links against src/stub/cuda_stub.cc.
// The file stays in the CUDA source list as the place for CUDA-only factory
// helpers should they ever be needed.
