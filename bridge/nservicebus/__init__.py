"""What NServiceBus defines: wire formats, error-queue copies, the messages endpoints write."""
