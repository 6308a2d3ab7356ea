//! Header of the one-pass wgmma decode (after the wgmma header): a split's blocks form a thread
//! block cluster of LC_CLUSTER_SIZE, fixed at compile time (MLX launches custom kernels without
//! a cluster dimension of its own).

#define LC_CLUSTER_SIZE 8
#undef __global__
#define __global__ __location__(global) __launch_bounds__(384, 1) __cluster_dims__(LC_CLUSTER_SIZE, 1, 1)
