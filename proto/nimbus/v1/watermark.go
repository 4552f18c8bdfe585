package nimbusv1

// StatusWatermarkHeader is the header of a ReportStatus stream by which nimbus says it takes
// status watermarks (StatusReport.watermark), with the value "1". An agent reports every
// status it holds to a nimbus that does not say so, and only a watermark and its exceptions
// to one that does (docs/status.md).
const StatusWatermarkHeader = "naples-status-watermark"
