//! The device the library runs on: an engine chooses it before the first call that uses MLX; a
//! GPU that does not work is refused with nothing changed (and by default the library falls
//! back to MLX's CPU rather than fail every call, as on a Mac virtual machine without a Metal
//! device); once chosen, only the same device is accepted; the cache works on the chosen
//! device. Whether a GPU works is asked of MLX directly, as the reference. (Its own test
//! binary: the device is chosen once per process.)
mod common;

use latent_cache::ffi::cache::*;
use latent_cache::ffi::device::*;
use latent_cache::ffi::latent_cache_status as Status;

use common::check::{append_host, assert_equal, host_data, last_error, new_cache};
use common::model::{Model, Rng};

const CPU: u32 = latent_cache_device::Cpu as u32;
const GPU: u32 = latent_cache_device::Gpu as u32;

/// MLX's own answer: a GPU backend whose device loads.
fn mlx_gpu_works() -> bool {
    unsafe {
        let device = mlx_sys::mlx_device_new_type(mlx_sys::mlx_device_type__MLX_GPU, 0);
        let mut available = false;
        let mut works = mlx_sys::mlx_device_is_available(&mut available, device) == 0 && available;
        if works {
            let mut info = mlx_sys::mlx_device_info_new();
            works = mlx_sys::mlx_device_info_get(&mut info, device) == 0;
            mlx_sys::mlx_device_info_free(info);
        }
        mlx_sys::mlx_device_free(device);
        works
    }
}

#[test]
fn the_engine_chooses_the_device_before_first_use_and_only_then() {
    assert_eq!(latent_cache_set_device(7), Status::InvalidArgument);
    assert!(last_error().contains("device 7"), "{}", last_error());

    let gpu = mlx_gpu_works();
    if gpu {
        // A machine with a GPU: the engine may still keep the library on the CPU.
        assert_eq!(latent_cache_set_device(GPU), Status::Ok, "{}", last_error());
        assert_eq!(latent_cache_set_device(CPU), Status::Ok, "{}", last_error());
    } else {
        assert_eq!(latent_cache_set_device(GPU), Status::Backend, "no working GPU: refused");
        assert!(last_error().contains("no working GPU"), "{}", last_error());
    }

    // First use: the cache works where it runs.
    let widths = [16, 8, 4];
    let cache = new_cache(widths, 0);
    let mut model = Model::new(widths);
    let data = host_data(&mut Rng::new(3), widths, 2, 5);
    assert_eq!(append_host(cache, 2, 5, &data), Status::Ok, "{}", last_error());
    model.append(2, 5, &data);
    assert_equal(cache, &model, "an append on the chosen device");
    let mut device = 99;
    assert_eq!(unsafe { latent_cache_get_device(&mut device) }, Status::Ok);
    assert_eq!(device, CPU, "chosen CPU (GPU machine) or the only device (no GPU)");

    // Chosen: the same device (or DEFAULT) is accepted, the other refused, nothing changes.
    assert_eq!(latent_cache_set_device(CPU), Status::Ok);
    assert_eq!(latent_cache_set_device(latent_cache_device::Default as u32), Status::Ok);
    assert_eq!(latent_cache_set_device(GPU), Status::InvalidState);
    assert!(last_error().contains("already runs on the CPU"), "{}", last_error());
    assert_eq!(unsafe { latent_cache_get_device(&mut device) }, Status::Ok);
    assert_eq!(device, CPU);
    assert_eq!(unsafe { latent_cache_get_device(std::ptr::null_mut()) }, Status::NullArgument);
    assert_equal(cache, &model, "after the refused choices");
    unsafe { latent_cache_free(cache) };
}
