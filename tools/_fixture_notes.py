"""What pnnx did to each fixture that an engine author would not guess (copied into meta.json "notes")."""

from __future__ import annotations

_BN_FOLD = "every conv+BatchNorm pair is folded into one nn.Conv2d named convbn2d_N (bias=True, new weights)"

NOTES: dict[str, list[str]] = {
    "resnet": [_BN_FOLD, "residual adds are pnnx.Expression add(@0,@1); torch.flatten keeps start_dim/end_dim"],
    "mobilenet_v2": [
        _BN_FOLD,
        "the model's nn.AdaptiveAvgPool2d call is written as F.adaptive_avg_pool2d (functional form)",
        "Dropout disappears",
    ],
    "mobilenet_v3": [
        _BN_FOLD,
        "squeeze-excitation stays AdaptiveAvgPool2d -> Conv2d -> ReLU -> Conv2d -> Hardsigmoid -> Expression mul",
    ],
    "squeezenet": ["MaxPool2d ceil_mode=True throughout; the conv classifier ends in AdaptiveAvgPool2d + flatten"],
    "shufflenet_v2": [
        _BN_FOLD,
        "torchvision's view/transpose/view channel_shuffle is fused into one nn.ChannelShuffle groups=2",
        "x.chunk(2, dim=1) is a 2-output torch.chunk; the global pool x.mean([2, 3]) is torch.mean dim=(2,3)",
    ],
    "densenet": [
        "DenseNet's BatchNorm comes BEFORE each conv (BN-ReLU-conv), so pnnx cannot fold it: nn.BatchNorm2d "
        "nodes stay, with running_mean/running_var/weight/bias in the bin",
        "F.relu and F.adaptive_avg_pool2d appear in functional form; transition layers use nn.AvgPool2d",
    ],
    "googlenet": [_BN_FOLD, "MaxPool2d ceil_mode=True; the four Inception branches meet in one 4-input torch.cat"],
    "efficientnet": [
        _BN_FOLD,
        "StochasticDepth and Dropout disappear in eval; SE block is AdaptiveAvgPool2d/Conv2d/SiLU/Conv2d/Sigmoid "
        "+ Expression mul(@0,@1) broadcasting (N,C,1,1) over (N,C,H,W)",
    ],
    "regnet": [
        _BN_FOLD,
        "module names contain '-' (trunk_output.block1.block1-0...), so the _pnnx.py pnnx generates does not even "
        "compile; operator names are not identifiers, dispatch on the type only",
    ],
    "convnext": [
        "LayerNorm2d (channels-first) becomes Tensor.permute -> nn.LayerNorm over the last dim -> Tensor.permute",
        "layer_scale (an nn.Parameter, randomised here instead of 1e-6) becomes a pnnx.Attribute (16,1,1) feeding "
        "an Expression mul; the 7x7 depthwise conv is not followed by BN so nothing is folded there",
    ],
    "unet": [
        _BN_FOLD,
        "F.interpolate(mode='nearest') is written as a separate operator type, F.upsample_nearest (no mode param)",
        "nn.Upsample(bilinear) stays nn.Upsample with align_corners=False and size=None",
    ],
    "transformer": [
        "nn.MultiheadAttention(batch_first=True) called with q=k=v is one operator with 1 input",
        "qkv.unbind(0) is a 3-output torch.unbind; k.transpose(-2,-1) is torch.transpose dim0=-2 dim1=-1",
        "the learned position embedding is a pnnx.Attribute added by an Expression",
        "the hand-written attention is NOT fused into SDPA: it stays matmul/Expression mul/F.softmax/matmul",
    ],
    "dynamic": [
        "exported with inputshape2: batch, H and W are '?' in every # annotation; channels stay numeric",
        "interpolate size taken from another tensor becomes pnnx.Expression expr=[size(@0,2),size(@0,3)] whose "
        "list output feeds F.upsample / F.upsample_nearest as $size",
        "reshape(y.size(0), -1, 6) becomes Expression [size(@0,0),-1,6] feeding Tensor.reshape as $shape",
        "squeeze(3).squeeze(2) becomes Tensor.reshape shape=(-1,16); unsqueeze stays torch.unsqueeze",
    ],
    "two_inputs": [
        "inputs are pnnx.Input #0 (f32) and #1 (i64); nn.Embedding reads i64 ids",
        "t.view(t.size(0), -1, 1, 1) is frozen to Tensor.reshape shape=(1,8,1,1) (static export)",
    ],
    "misc_activations": [
        "functional activations keep F.* types (F.tanh, F.hardsigmoid, F.hardswish, F.silu, F.gelu, F.relu6, "
        "F.sigmoid) while module ones are nn.* (nn.PReLU, nn.LeakyReLU, nn.ELU, nn.GELU approximate=tanh)",
        "torch.clamp with one bound writes the other as None (min=None)",
        "sqrt/abs/exp/neg/div arithmetic is fused into Expressions such as mul(sqrt(add(abs(@0),0.001)),exp(neg(@1)))",
        "the raw nn.Parameter is a pnnx.Attribute at the top of the graph",
    ],
    "misc_norm_pool": [
        "the BatchNorm2d on the raw input has no conv before it and stays nn.BatchNorm2d",
        "InstanceNorm2d writes affine and track_running_stats=False; without affine there are no weights",
        "AvgPool2d always writes count_include_pad, ceil_mode and divisor_override=None",
    ],
    "misc_conv_resize": [
        "padding='same' stays the string padding=same (also with dilation 2 and groups); reflect/replicate "
        "padding_mode write explicit padding=(1,1)/(1,2)",
        "standalone F.pad keeps mode=constant value=0.5 / mode=reflect value=None / mode=replicate value=None",
        "ConvTranspose2d writes output_padding and groups; nearest interpolate is F.upsample_nearest",
    ],
    "misc_shapes": [
        "x[:, 1:7:2, ::2, 1:] is ONE Tensor.slice with dims/starts/ends/steps/selects lists; open ends and "
        "'no select' are written as 2147483647",
        "x[:, 3] is Tensor.select dim=1 index=3; torch.split writes split_size_or_sections and input $tensor",
        "squeeze/squeeze/unsqueeze/unsqueeze chains collapse into one Tensor.reshape (static shapes)",
        "the view/transpose/view channel shuffle is fused into nn.ChannelShuffle",
        "nested tuple outputs give three prim::TupleConstruct nodes; outputs are flattened depth-first",
    ],
    "vit": [
        "with torch's MHA fast path on (the eval default) nn.TransformerEncoderLayer traces to "
        "aten::_transformer_encoder_layer_fwd, which pnnx leaves unconverted (and its _pnnx.py does not compile); "
        "the generator traces this model with the fast path off, giving nn.MultiheadAttention + LayerNorm + Linear",
        "cls_token.expand(batch, -1, -1) is constant-folded at the static batch into a pnnx.Attribute (2,1,32)",
        "x[:, 0] readout is Tensor.select; the encoder's GELU is F.gelu",
    ],
    "yolo": [
        _BN_FOLD,
        "the Focus slices x[..., ::2, ::2] are 4-D Tensor.slice with dims=(2,3) steps=(2,2)",
        "p[..., 0:2], p[..., 2:4], p[..., 4:] become ONE 3-output torch.tensor_split dim=4 indices=(2,4)",
        "the arange/expand/cat grid is constant-folded into a pnnx.Attribute; anchors (a buffer) too",
        "decode arithmetic is fused: mul(add(sub(mul(@0,2.0),0.5),@1),8.0) and mul(pow(mul(@0,2.0),2),@1)",
    ],
    "misc_forms": [
        "F.conv2d with nn.Parameter weights followed by F.batch_norm becomes ONE nn.Conv2d (BN folded); "
        "F.linear with a Parameter becomes nn.Linear bias=False",
        "F.adaptive_max_pool2d is written with return_indices=True and TWO outputs; the indices output is unused",
        "functional norms keep F.group_norm / F.layer_norm / F.instance_norm with weight=None bias=None "
        "(and running_mean=None running_var=None)",
        "pnnx keeps the spelling: nn.Tanh/nn.Sigmoid/nn.Softmax/nn.LogSoftmax vs F.*, F.max_pool2d/F.avg_pool2d vs "
        "nn.*; nn.ZeroPad2d/ReflectionPad2d/ReplicationPad2d and nn.UpsamplingBilinear2d/Nearest2d stay modules",
        "nn.Flatten becomes torch.flatten; nn.Dropout and nn.Identity vanish",
        "x.mean() with no dim is torch.mean without a dim param (0-d result) feeding F.elu and a broadcast",
    ],
}
