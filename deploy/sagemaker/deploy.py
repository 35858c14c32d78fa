"""Deploy the S1-mini Studio image to an Amazon SageMaker real-time (or asynchronous) endpoint with
the SageMaker Python SDK v2. Run where AWS credentials and `pip install "sagemaker>=2.200,<3" boto3` are set up
(version 3 of the SDK removed sagemaker.model):

    python deploy/sagemaker/deploy.py --image <account>.dkr.ecr.<region>.amazonaws.com/s1-mini-studio:latest \
        --role arn:aws:iam::<account>:role/<SageMakerExecutionRole> [--model-data s3://bucket/s1-mini.tar.gz] \
        [--instance-type ml.g5.xlarge] [--async-output s3://bucket/s1-mini-async/]

Without --model-data the container downloads the checkpoint at start (pass --hf-token); with it,
SageMaker extracts the archive into /opt/ml/model, which `serve` mode loads. docs/DEPLOYMENT.md
(SageMaker) walks through building and pushing the image and calling the endpoint.
"""

from __future__ import annotations

import argparse


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image", required=True, help="the image's ECR URI")
    p.add_argument("--role", required=True, help="SageMaker execution role ARN")
    p.add_argument("--model-data", help="s3:// URI of a .tar.gz holding the checkpoint files at its root")
    p.add_argument("--hf-token", help="Hugging Face token, when the container downloads the checkpoint")
    p.add_argument("--instance-type", default="ml.g5.xlarge")
    p.add_argument("--name", default="s1-mini-studio")
    p.add_argument("--async-output", metavar="S3_URI", help="deploy an asynchronous endpoint writing results here")
    args = p.parse_args(argv)

    try:
        from sagemaker.model import Model
    except ImportError:  # not installed, or version 3 (no sagemaker.model)
        p.error('needs the SageMaker Python SDK v2: pip install "sagemaker>=2.200,<3" boto3')

    env = {"S1_MINI_MAX_TEXT_LENGTH": "0"}  # long texts: the async endpoint takes them (up to 1 GB payloads)
    if args.hf_token:
        env["HF_TOKEN"] = args.hf_token
    model = Model(image_uri=args.image, role=args.role, model_data=args.model_data, env=env, name=args.name)
    # The first start downloads and compiles: give the /ping health check time.
    common = dict(initial_instance_count=1, instance_type=args.instance_type, endpoint_name=args.name,
                  container_startup_health_check_timeout=1800, model_data_download_timeout=1800)
    if args.async_output:
        from sagemaker.async_inference import AsyncInferenceConfig

        model.deploy(**common, async_inference_config=AsyncInferenceConfig(output_path=args.async_output))
    else:
        model.deploy(**common)
    print(f"endpoint {args.name} is InService")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
