"""The report's sections: each turns compute/ results into blocks of the document model."""
