"""The front door (issue 37): the endpoint picker Envoy asks where each session request goes."""
