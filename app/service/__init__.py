"""What the three services share: TLS that follows its files, certificates, the metric rules, settings from
flags."""
