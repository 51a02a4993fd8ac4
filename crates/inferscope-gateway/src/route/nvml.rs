//! The GPUs of the gateway's own host, read through NVML (`metrics: { gpu_url: nvml }`), for a
//! gateway that runs beside its engine on the GPU host. Behind the `nvml` cargo feature
//! (`cargo build --features nvml`); the library (`libnvidia-ml.so.1`) is loaded at run time, so a
//! host without a driver or a GPU says so and nothing else changes.

use super::engine::GpuView;

/// Reads every GPU of this host; `Err` says why not ("no GPU: …").
#[cfg(feature = "nvml")]
pub fn read() -> Result<GpuView, String> {
    use nvml_wrapper::enum_wrappers::device::Clock;
    use nvml_wrapper::Nvml;
    use std::sync::OnceLock;
    static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();
    let nvml = NVML
        .get_or_init(|| Nvml::init().map_err(|e| format!("no GPU: NVML could not start ({e})")))
        .as_ref()
        .map_err(Clone::clone)?;
    let n = nvml
        .device_count()
        .map_err(|e| format!("no GPU: NVML lists none ({e})"))?;
    if n == 0 {
        return Err("no GPU: NVML lists none".into());
    }
    let mut g = GpuView {
        count: n,
        ..GpuView::default()
    };
    let (mut util, mut clock) = ((0.0, 0u32), (0.0, 0u32));
    let add = |acc: &mut Option<f64>, v: f64| *acc = Some(acc.unwrap_or(0.0) + v);
    for i in 0..n {
        let d = nvml
            .device_by_index(i)
            .map_err(|e| format!("GPU {i}: {e}"))?;
        if let Ok(u) = d.utilization_rates() {
            util = (util.0 + f64::from(u.gpu) / 100.0, util.1 + 1);
        }
        if let Ok(m) = d.memory_info() {
            add(&mut g.memory_used_bytes, m.used as f64);
            add(&mut g.memory_total_bytes, m.total as f64);
        }
        if let Ok(mw) = d.power_usage() {
            add(&mut g.power_watts, f64::from(mw) / 1000.0);
        }
        if let Ok(mj) = d.total_energy_consumption() {
            add(&mut g.energy_joules, mj as f64 / 1000.0);
        }
        if let Ok(mhz) = d.clock_info(Clock::SM) {
            clock = (clock.0 + f64::from(mhz) * 1e6, clock.1 + 1);
        }
    }
    g.utilization = (util.1 > 0).then(|| util.0 / f64::from(util.1));
    g.sm_clock_hz = (clock.1 > 0).then(|| clock.0 / f64::from(clock.1));
    Ok(g)
}

/// Without the `nvml` feature there is nothing to read.
#[cfg(not(feature = "nvml"))]
pub fn read() -> Result<GpuView, String> {
    Err("no GPU: this build has no NVML support (cargo build --features nvml)".into())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_host_without_a_gpu_says_so() {
        // CI machines have no NVIDIA driver: with or without the feature, the answer is a clean
        // "no GPU", never a panic. On a GPU host with the feature, it lists the GPUs.
        match super::read() {
            Err(e) => assert!(e.starts_with("no GPU"), "{e}"),
            Ok(g) => assert!(g.count > 0),
        }
    }
}
