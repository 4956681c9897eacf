//! The schema of a schedule as written ([`ScheduleSpec`]), for the chart's generated values schema.
//!
//! The runtime's `ScheduleSpec` does not derive `JsonSchema` yet; this mirrors its fields (same names, same
//! serde attributes) and goes when it does. Only the schema uses it: parsing is the runtime's type.
//!
//! [`ScheduleSpec`]: kcp_keeper_runtime::schedule::ScheduleSpec

/// A cron schedule.
#[derive(schemars::JsonSchema)]
#[schemars(rename = "ScheduleSpec")]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
pub struct ScheduleSpecSchema {
    /// Standard 5-field cron (`0 3 * * *`), 6 or 7 fields with seconds and years, or `@daily` and friends.
    pub cron: String,
    /// IANA zone name (`Europe/Berlin`); UTC when absent.
    #[serde(default)]
    pub time_zone: Option<String>,
    /// Go-style duration (`5m`): each tick fires up to this much later.
    #[serde(default)]
    pub jitter: Option<String>,
    /// What to do with ticks that passed without a run: `runOnce` (the default) runs once for all of them, as
    /// soon as possible; `skip` drops the ones later than the starting deadline.
    #[serde(default)]
    pub missed: MissedSchema,
    /// Go-style duration: how late a tick may still start (beyond its jitter); 5m when absent.
    #[serde(default)]
    pub starting_deadline: Option<String>,
}

#[derive(schemars::JsonSchema, Default)]
#[schemars(rename = "Missed")]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
pub enum MissedSchema {
    #[default]
    RunOnce,
    Skip,
}

#[cfg(test)]
mod tests {
    use kcp_keeper_runtime::schedule::ScheduleSpec;

    #[test]
    fn the_mirror_has_exactly_the_runtime_types_fields() {
        let spec: ScheduleSpec = serde_yaml::from_str("cron: '0 3 * * *'").unwrap();
        // Without `..`: a field added to the runtime's type stops this compiling.
        let ScheduleSpec { cron: _, time_zone: _, jitter: _, missed: _, starting_deadline: _ } = spec;
        let schema = serde_json::to_value(schemars::schema_for!(super::ScheduleSpecSchema)).unwrap();
        let mut fields: Vec<&String> = schema["properties"].as_object().unwrap().keys().collect();
        fields.sort();
        assert_eq!(fields, ["cron", "jitter", "missed", "startingDeadline", "timeZone"]);
        assert_eq!(schema["$defs"]["Missed"]["enum"], serde_json::json!(["runOnce", "skip"]));
    }
}
