"""The PDDeployment API: pydantic models (`types`) and the CRD generated from them (`crd`)."""
